from __future__ import annotations

import pytest

ray = pytest.importorskip(
    "ray", reason="Ray is an optional extra (pip install 'hybridsim[ray]'); the ray executor test needs it"
)

import sweep_fakes  # noqa: E402
from sweep_fakes import fake_load, fake_run  # noqa: E402

from sim.sweep import build_sweep, run_sweep  # noqa: E402

pytestmark = pytest.mark.slow  # end-to-end: runs whole scenarios (make test-fast skips it)


@pytest.fixture
def local_ray():
    # Ray workers do not see pytest's sys.path entry for this directory: ship the fakes by value.
    ray.cloudpickle.register_pickle_by_value(sweep_fakes)
    ray.init(num_cpus=1, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sweep_fakes)


def test_ray_sweep_matches_the_serial_sweep_byte_for_byte(tmp_path, base_scenario, local_ray):
    spec = build_sweep(
        base_scenario, ["cache.num_blocks=400,800", "scheduler.prefix_policy=pr48425,explode"], seeds="2"
    )
    common = dict(load_fn=fake_load, run_fn=fake_run, progress=False)
    result = run_sweep(spec, tmp_path / "ray", executor="ray", jobs=2, **common)
    run_sweep(spec, tmp_path / "serial", executor="serial", **common)
    assert ray.is_initialized()  # the executor leaves a cluster it did not start alone
    assert [r.status for r in result.runs].count("failed") == 4
    for name in ("sweep.parquet", "sweep.json"):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "serial" / name).read_bytes()
