"""Smoke test of examples/train_gpt.py on CPU: a tiny configuration trains with flashattn and with
SDPA, the two runs agree, and the JSON summary has what the GPU run reports."""

import importlib.util
import json
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE.parents[1] / "examples" / "train_gpt.py"


def load_script():
    spec = importlib.util.spec_from_file_location("train_gpt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_gpt"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_train_gpt_smoke(tmp_path, capsys):
    train_gpt = load_script()
    out = tmp_path / "results.json"
    code = train_gpt.main(["--data", str(HERE / "data" / "tinyshakespeare_lines.txt"), "--out", str(out),
                           "--device", "cpu", "--steps", "6", "--context", "32", "--layers", "1", "--heads", "2",
                           "--head-dim", "16", "--batch-size", "2", "--log-every", "2", "--eval-batches", "2",
                           "--timing-warmup", "1", "--generate", "20"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "final validation loss" in printed and "throughput" in printed
    result = json.loads(out.read_text())
    fa, sd = result["flashattn"], result["sdpa"]
    assert [s for s, _ in fa["train_loss"]] == [s for s, _ in sd["train_loss"]]
    for (_, a), (_, b) in zip(fa["train_loss"], sd["train_loss"]):
        assert abs(a - b) <= 1e-3 * abs(b), (a, b)
    assert result["val_loss_agree"] and result["val_loss_relative_gap"] < 1e-3
    assert fa["tokens_per_s"] > 0 and sd["tokens_per_s"] > 0
    assert len(result["sample"]) > 20
