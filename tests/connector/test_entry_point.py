import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from support.connector import FA, request, step_ctx

import sim.connector as registry
import sim.core.registry

EXAMPLE_SRC = Path(__file__).resolve().parents[2] / "examples" / "connectors" / "src"


@pytest.fixture
def example_plugin(monkeypatch):
    """Pretend the example package is installed: its source on sys.path and its entry point registered."""
    monkeypatch.syspath_prepend(str(EXAMPLE_SRC))
    ep = EntryPoint(
        name="system_prompt",
        value="hybridsim_example_connector:SystemPromptConnector",
        group=registry.ENTRY_POINT_GROUP,
    )

    def fake_entry_points(group=None, **_):
        return [ep] if group == registry.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(sim.core.registry, "entry_points", fake_entry_points)
    yield
    sys.modules.pop("hybridsim_example_connector", None)


def test_example_connector_loads_through_the_entry_point(example_plugin):
    assert "system_prompt" in registry.connector_names()
    conn = registry.create_connector("system_prompt", content="sys", prefix_tokens=100)
    ctx, _ = step_ctx(FA)
    conn.bind(ctx)
    r = request("r", ("sys", 120), ("user", 30))
    assert conn.get_num_new_matched_tokens(r, 0) == (96, False)  # 100 rounded down to 16-token blocks
    assert conn.get_num_new_matched_tokens(r, 32) == (64, False)
    assert conn.get_num_new_matched_tokens(request("x", ("user", 120)), 0) == (0, False)
    assert conn.metrics() == {"queries": 3, "hit_tokens": 160}


def test_example_connector_options_are_checked(example_plugin):
    with pytest.raises(ValueError, match="prefix_tokens"):
        registry.create_connector("system_prompt", content="sys", prefix_tokens=0)
