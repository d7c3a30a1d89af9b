"""DDP honours ``model.require_backward_grad_sync = False`` as torch does (nanoGPT's gradient
accumulation): no communication in the flagged micro-steps, the same gradients as no_sync,
at float32 and with the float16 GradScaler; two ranks under the launcher."""

from procs import REPO, run_python


def test_require_backward_grad_sync_accumulates_like_no_sync():
    job = run_python(["-m", "minidist.launch", "--standalone", "--nproc-per-node", "2",
                      REPO / "tests" / "ddp" / "grad_sync_rank.py"], timeout_s=180)
    assert job.returncode == 0, job.report()
    assert "grad sync ok" in job.stdout, job.report()
