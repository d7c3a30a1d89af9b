"""``WeakIdKeyDictionary``: a dict keyed by object identity that forgets a key when it dies.

``weakref.WeakKeyDictionary`` compares keys with ``==``, and a Tensor's ``==`` is elementwise
(a bool Tensor, as torch), so it cannot key one by tensors. This one keys by ``id(key)`` and
drops the entry when the key is garbage-collected (torch has the same class in
``torch.utils.weak``)::

    owners = WeakIdKeyDictionary()
    owners[param] = optimizer          # param stays collectable; its entry goes with it
    owners.get(param)
"""

from __future__ import annotations

import weakref
from typing import Any, Iterator


class WeakIdKeyDictionary:
    """Weak keys compared by identity (``is``), never by ``==``."""

    def __init__(self) -> None:
        self._data: dict[int, tuple[weakref.ref, Any]] = {}

    def __setitem__(self, key: Any, value: Any) -> None:
        k = id(key)
        data = self._data

        def forget(_ref: weakref.ref, k: int = k) -> None:
            entry = data.get(k)
            if entry is not None and entry[0] is _ref:
                del data[k]

        self._data[k] = (weakref.ref(key, forget), value)

    def _entry(self, key: Any) -> Any:
        entry = self._data.get(id(key))
        return entry if entry is not None and entry[0]() is key else None

    def __getitem__(self, key: Any) -> Any:
        entry = self._entry(key)
        if entry is None:
            raise KeyError(key)
        return entry[1]

    def get(self, key: Any, default: Any = None) -> Any:
        entry = self._entry(key)
        return default if entry is None else entry[1]

    def __contains__(self, key: Any) -> bool:
        return self._entry(key) is not None

    def __delitem__(self, key: Any) -> None:
        if self._entry(key) is None:
            raise KeyError(key)
        del self._data[id(key)]

    def pop(self, key: Any, default: Any = None) -> Any:
        entry = self._entry(key)
        if entry is None:
            return default
        del self._data[id(key)]
        return entry[1]

    def __len__(self) -> int:
        return sum(1 for ref, _ in self._data.values() if ref() is not None)

    def keys(self) -> Iterator[Any]:
        for ref, _ in list(self._data.values()):
            key = ref()
            if key is not None:
                yield key

    __iter__ = keys
