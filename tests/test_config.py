"""YAML configs: presets load, and every bad key or value names the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from moe_backend.config import ConfigError, bench_presets_dir, load_bench


@pytest.mark.parametrize("path", sorted(bench_presets_dir().glob("*.yaml")), ids=lambda p: p.stem)
def test_presets_load(path: Path) -> None:
    preset = load_bench(path)
    spec = preset.comm.to_spec(preset.bench.world_size)
    assert spec.hidden in (4096, 7168)
    assert max(preset.bench.num_tokens) <= spec.max_num_tokens


def test_deepseek_decode_preset_matches_the_model() -> None:
    spec = load_bench(bench_presets_dir() / "deepseek_decode.yaml").comm.to_spec(2)
    assert (spec.num_experts, spec.topk, spec.hidden, spec.max_num_tokens) == (256, 8, 7168, 128)
    assert spec.in_dtype == torch.float8_e4m3fn and spec.scale_block_size == 128 and spec.out_dtype == torch.bfloat16


GOOD = """
name: t
comm: {num_experts: 8, topk: 2, hidden: 64, max_num_tokens: 16}
bench: {num_tokens: [4, 16]}
"""


@pytest.mark.parametrize(
    "text, pattern",
    [
        (GOOD.replace("topk: 2", "topk: 2, top_k: 3"), r"comm\.top_k: unknown key"),
        (GOOD.replace("topk: 2", "topk: two"), r"comm\.topk: expected int, got 'two'"),
        (GOOD.replace("hidden: 64, ", ""), r"comm\.hidden: required key is missing"),
        (GOOD.replace("num_experts: 8", "num_experts: 7"), r"num_experts=7 must be divisible by the group size 2"),
        (GOOD.replace("[4, 16]", "[4, 17]"), r"bench\.num_tokens: \[17\] not in \[1, comm\.max_num_tokens=16\]"),
        (GOOD.replace("max_num_tokens: 16", "max_num_tokens: 16, in_dtype: int3"), r"unknown dtype 'int3'"),
        (GOOD + "extra: 1\n", r"extra: unknown key"),
        ("- just a list\n", r"expected a mapping"),
        ("comm: [\n", r"cannot read"),
    ],
)
def test_bad_config_names_file_and_key(tmp_path: Path, text: str, pattern: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=pattern) as err:
        load_bench(path)
    assert str(path) in str(err.value)


def test_single_number_for_a_list(tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    path.write_text(GOOD.replace("[4, 16]", "8"))
    assert load_bench(path).bench.num_tokens == [8]
