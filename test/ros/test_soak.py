"""The short soak (about 2 minutes, hostile clients included) that CI runs; README reports a 30-minute,
8-session run."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "soak"))

from soak import soak   # noqa: E402


def test_short_soak(ros_env_module):
    report = soak(seconds=100, sessions=4, seed=7, drain_every_s=30, env=ros_env_module)
    print({k: v for k, v in report.items() if k != "hostile"}, report["hostile"]["runs"])
    assert report["requests"] >= 20, report
    assert report["missing_final"] == [] and report["duplicate_final"] == [] and report["stalls"] == [], report
    hostile = report["hostile"]
    assert len(hostile["runs"]) >= 5 and hostile["commands"] > 100, hostile     # the first five modes ran (hung: in longer runs)
    assert hostile["missing_final"] == [] and hostile["duplicate_final"] == [], hostile
    assert hostile["service_calls"] == hostile["service_answers"] > 100, hostile
    assert report["drains"] >= 3                  # each drain asserted used blocks == idle baseline
    assert report["log_problems"] == [], report["log_problems"]
    assert report["node_exit_code"] == 0
    assert report["rss_slope_mib_per_hour"] < 200, report   # 90 s is too short for a fine figure
