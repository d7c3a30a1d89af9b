"""``torch.backends``' flags, accepted so that scripts setting them run unchanged.

    import minidist
    minidist.backends.cuda.matmul.allow_tf32 = True   # nanoGPT, imagenet, Barlow Twins set these
    minidist.backends.cudnn.allow_tf32 = True
    minidist.backends.cudnn.benchmark = True
    import minidist.backends.cudnn as cudnn             # imagenet's spelling works too

What they mean here: minidist has no cuDNN and no TF32 switch of its own. Convolutions are
im2col GEMMs (minidist/tensor/conv.py), so there is no algorithm for ``cudnn.benchmark`` to
pick, and they are deterministic, so ``cudnn.deterministic`` changes nothing. float32 matrix
products go through NumPy's BLAS on the CPU and CuPy's cuBLAS on a GPU; CuPy uses TF32 only
when the environment sets ``CUPY_TF32=1`` before CuPy starts, which these flags do not do. So
every flag is stored and readable, and none changes a result or a speed.
"""

from minidist.backends import cuda, cudnn, mps

__all__ = ["cuda", "cudnn", "mps"]
