"""The method modules (methods, inplace_methods, conversion) and how core.py attaches them."""

import ast
import inspect

import pytest

from minidist.tensor import Tensor, conversion, inplace_methods, methods

MODULES = [methods, inplace_methods, conversion]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_table_entry_is_on_tensor(module):
    for name, attr in module.METHODS.items():
        assert Tensor.__dict__[name] is attr, f"Tensor.{name} is not {module.__name__}'s"


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_function_taking_self_is_in_the_table(module):
    # A method written in the module but left out of METHODS would silently not exist.
    listed = {id(getattr(a, "fget", a)) for a in module.METHODS.values()}
    for name, fn in vars(module).items():
        if inspect.isfunction(fn) and fn.__module__ == module.__name__:
            params = list(inspect.signature(fn).parameters)
            if params and params[0] == "self":
                assert id(fn) in listed, f"{module.__name__}.{name} takes self but is not in METHODS"


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_methods_use_only_the_public_surface(module):
    # The method modules are not mixins: they reach no private field of the tensor, except
    # __repr__ printing the tape's op name (as torch prints grad_fn).
    allowed = {"_op"} if module is conversion else set()
    tree = ast.parse(inspect.getsource(module))
    private = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
               and n.attr.startswith("_") and not n.attr.endswith("__")}
    assert private <= allowed, f"{module.__name__} reaches {sorted(private - allowed)}"


def test_attached_methods_behave_as_methods():
    x = Tensor([[1.0, -2.0], [3.0, -4.0]], requires_grad=True)
    assert x.relu().sum(dim=1).tolist() == [1.0, 3.0]
    assert x.T.shape == (2, 2) and x.size(1) == 2 and x.dim() == 2
    assert repr(Tensor([0.5])) == "tensor([0.5000])" and f"{Tensor(0.25):.2f}" == "0.25"
    y = Tensor([1.0, 2.0])
    y += 1
    assert y.tolist() == [2.0, 3.0] and float(y.sum()) == 5.0 and y.long().tolist() == [2, 3]
