"""The pure parts of the checkpoint-overhead experiment: block peaks, CSV rows, the 1.216B extrapolation."""

from __future__ import annotations

import math

import pytest

from experiments.ckpt_analysis import claims, data_rows, extrapolate, paper_implied
from experiments.ckpt_sweep import ModelSize, block_peaks, configs


def test_block_peaks_take_the_largest_sample_inside_each_window():
    samples = [(0.0, 5), (1.0, 9), (2.0, 7), (3.0, 20), (4.0, 6)]
    assert block_peaks([(0.5, 2.5), (2.9, 4.0), (10.0, 11.0)], samples) == [9, 20, 0]


def test_model_size_params_matches_transformers():
    transformers = pytest.importorskip("transformers")
    s = ModelSize(vocab=1000, hidden=64, intermediate=160, layers=2, heads=4, kv_heads=2, seq=16, batch=1)
    cfg = transformers.MistralConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = transformers.MistralForCausalLM(cfg)
    assert s.params() == sum(p.numel() for p in model.parameters())


def _summary(config, mode, interval, step, cpu, bytes_ckpt, peak):
    return {
        "config": config,
        "mode": mode,
        "interval": interval,
        "step_mean_s": step,
        "step_median_s": step,
        "overhead_pct": 0.0,
        "overhead_median_pct": 0.0,
        "cpu_per_step_s": cpu,
        "cpu_overhead_pct": 0.0,
        "stall_mean_s": 0.0,
        "stage_mean_s": 0.0,
        "write_mean_s": 0.0,
        "drain_mean_s": 0.0,
        "saves": 4,
        "bytes_per_ckpt": bytes_ckpt,
        "bytes_per_hour": 0.0,
        "host_peak_bytes": peak,
        "host_peak_max_bytes": peak,
        "save_rss_peak_delta_sum": 0,
        "train_rss_sum": 0,
        "step_blocks_s": [step],
    }


SMALL = ModelSize(vocab=1000, hidden=64, intermediate=160, layers=2, heads=4, kv_heads=2, seq=64, batch=2)


def _rows():
    p = SMALL.params()
    return data_rows(
        "small",
        SMALL,
        [
            _summary("none", "none", 0, 1.0, 2.0, 0, 4 * 2**30),
            _summary("async", "async", 1, 1.5, 3.0, 12 * p, 5 * 2**30),
            _summary("every_4_async", "async", 4, 1.1, 2.2, 12 * p, 5 * 2**30),
        ],
    )


def test_data_rows_derive_bytes_per_param_and_checkpoint_memory():
    rows = _rows()
    assert [r["bytes_per_param"] for r in rows] == [0, 12, 12]
    assert math.isclose(rows[1]["ckpt_extra_host_gib"], 1.0) and rows[0]["ckpt_extra_host_gib"] == 0


def test_extrapolation_scales_bytes_and_memory_with_params_and_compute_with_tokens():
    rows = _rows()
    same_tokens = ModelSize(vocab=1000, hidden=128, intermediate=320, layers=4, heads=4, kv_heads=2, seq=64, batch=2)
    ratio = same_tokens.params() / SMALL.params()
    x = {r["config"]: r for r in extrapolate(rows, same_tokens)}
    # Same tokens per step: save time and compute both scale with params -> overhead unchanged.
    assert math.isclose(x["async"]["overhead_pct"], 50.0)
    assert math.isclose(x["none"]["step_s"], 1.0 * ratio)
    assert math.isclose(x["async"]["bytes_per_ckpt"], 12 * same_tokens.params())
    assert math.isclose(x["async"]["ckpt_extra_host_gib"], 1.0 * ratio)
    assert math.isclose(x["async"]["train_state_gib"], 16 * same_tokens.params() / 2**30)
    # Four times the tokens: compute x4, save time unchanged -> overhead / 4; every-4 writes a quarter.
    more_tokens = ModelSize(**{**SMALL.__dict__, "seq": 256})
    y = {r["config"]: r for r in extrapolate(rows, more_tokens)}
    assert math.isclose(y["async"]["overhead_pct"], 50.0 / 4)
    assert math.isclose(
        y["every_4_async"]["tb_per_hour"] * 4 * y["every_4_async"]["step_s"], 12 * SMALL.params() * 3600 / 1e12
    )


def test_paper_implied_step_times_are_consistent_with_its_figures():
    imp = paper_implied()
    assert math.isclose(imp["bytes_per_ckpt"] / imp["step_with_s"] * 3600 / 1e12, 3.39)
    assert math.isclose(imp["step_with_s"] / imp["step_without_s"], 1 + 6.567)


def test_claims_flag_a_smaller_overhead_as_worse_with_its_reason():
    rows = _rows()
    for r in rows:
        r["overhead_pct"] = (r["step_mean_s"] / 1.0 - 1) * 100
        r["cpu_overhead_pct"] = 0.0
    rows.append({**rows[1], "config": "async_cached"})
    extra = extrapolate(rows, SMALL)
    out = claims(rows, extra, "small", "async_cached")
    from experiments.provenance import verdict

    first = verdict(out[0])
    assert first.startswith("worse than the paper:") and "CPU" in first
    assert all(verdict(c) for c in out)  # every row has the reason its verdict needs


def test_unknown_config_name_is_refused():
    with pytest.raises(ValueError, match="choose from"):
        configs(5, ["none", "asynch"])
