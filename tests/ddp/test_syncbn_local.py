"""SyncBatchNorm in one process: convert_sync_batchnorm keeps the Parameters and buffers, and
without a process group of more than one rank the layer is a plain BatchNorm (as torch)."""

import numpy as np

import minidist
from minidist import Tensor, nn


def test_convert_keeps_parameters_and_acts_as_batchnorm_alone():
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(),
                          nn.Sequential(nn.Flatten(), nn.BatchNorm1d(12)))
    ref = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(),
                        nn.Sequential(nn.Flatten(), nn.BatchNorm1d(12)))
    ref.load_state_dict(model.state_dict())
    weight, mean = model[1].weight, model[1].running_mean
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(model[1], nn.SyncBatchNorm) and isinstance(model[3][1], nn.SyncBatchNorm)
    assert model[1].weight is weight and model[1].running_mean is mean
    assert list(model.state_dict()) == list(ref.state_dict())
    x = np.random.default_rng(0).standard_normal((4, 2, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(model(Tensor(x)).array, ref(Tensor(x)).array, rtol=1e-6)
    np.testing.assert_allclose(model[3][1].running_var.array, ref[3][1].running_var.array)
    model.eval(), ref.eval()
    np.testing.assert_allclose(model(Tensor(x)).array, ref(Tensor(x)).array, rtol=1e-6)
    single = nn.SyncBatchNorm.convert_sync_batchnorm(nn.BatchNorm1d(5))
    assert type(single) is nn.SyncBatchNorm and single.num_features == 5
