"""pyproject.toml: what `pip install` reads (the license as an SPDX string, the extras) agrees with what the
Makefile installs and tests."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def makefile_variable(name: str) -> list[str]:
    (value,) = re.findall(rf"^{name}\s*:=\s*(.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    return value.split()


def test_the_license_is_an_spdx_expression_not_a_table():
    # a TOML table (license = {text = ...}) is deprecated by setuptools, refused after 2027-02-18
    assert PROJECT["license"] == "BSD-3-Clause"


def test_the_accelerate_extra_pins_what_make_test_accelerate_installs_and_tests():
    assert sorted(PROJECT["optional-dependencies"]["accelerate"]) == sorted(makefile_variable("ACC_PINS"))


def test_the_torchtitan_extra_pins_torchtitan_and_spmd_types_as_make_test_torchtitan_does():
    pins = set(makefile_variable("TITAN_NODEPS"))
    assert set(PROJECT["optional-dependencies"]["torchtitan"]) <= pins
