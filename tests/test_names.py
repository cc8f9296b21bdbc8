"""One meaning per name: what ``config.yaml`` and the trainer's command line say about the method a run trains,
and ``VIEWS_ON``, the values of ``data.views_on``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hypersolid_scale.config.schema import load_config, save_config, to_dict
from hypersolid_scale.data.config import VIEWS_ON
from hypersolid_scale.methods import method_names
from hypersolid_scale.safety.errors import ConfigError
from hypersolid_scale.training.trainer import parse_args


@pytest.mark.parametrize("method", ["hypersolid", "simclr"])
def test_config_yaml_holds_the_chosen_method_s_and_format_s_sections_only(tmp_path: Path, method: str) -> None:
    cfg = load_config(None, [f"method.name={method}", "data.format=webdataset", "data.path=/d", f"run_dir={tmp_path}"])
    written = yaml.safe_load(save_config(cfg, tmp_path).read_text())
    assert set(written["method"]) == {"name", method}
    assert "webdataset" in written["data"] and "ffcv" not in written["data"]
    assert to_dict(load_config(tmp_path / "config.yaml")) == to_dict(cfg)  # read back as the same config


def test_the_command_line_names_every_method_it_can_train(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "method.name" in text and "Hypersolid pre-training" not in text
    assert all(name in text for name in method_names())


def test_views_on_takes_the_values_of_views_on() -> None:
    base = ["data.format=webdataset", "data.path=/d"]
    assert {load_config(None, [*base, f"data.views_on={v}"]).data.views_on for v in VIEWS_ON} == set(VIEWS_ON)
    with pytest.raises(ConfigError, match=r"data.views_on='gpu' is not one of \('workers', 'device'\)"):
        load_config(None, [*base, "data.views_on=gpu"])
