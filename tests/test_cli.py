"""The command line end to end: tables, JSON, export/estimate round trip, one-line errors."""

import json
import subprocess
import sys

import pytest
import yaml



def run(*args, cwd=None):
    """Run the real entry point in a subprocess: (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd)
    return proc.returncode, proc.stdout, proc.stderr


def test_search_table_and_summary():
    code, out, err = run("search", "--model", "175b", "--gpus", "512", "--top", "3")
    assert code == 0, err
    assert "gpt3-175b (174.6B parameters) on 512 x H100-SXM5-80GB" in out
    assert "MFU" in out and "tokens/s" in out and "Winner:" in out and "Pruned:" in out
    assert sum(1 for line in out.splitlines() if line.lstrip()[:2] in {"1 ", "2 ", "3 "}) == 3


def test_search_json_and_export_round_trip(tmp_path):
    plan = tmp_path / "plan.yaml"
    code, out, err = run("search", "--model", "175b", "--gpus", "512", "--top", "2", "--json",
                         "--export", str(plan))
    assert code == 0, err
    ranked = json.loads(out)
    assert len(ranked) == 2
    best = ranked[0]
    gpus = best.pop("gpus")  # search --json only: tp*cp*pp*dp beside the layout
    assert set(best) == {"layout", "memory", "time", "throughput", "stages", "ties", "to_fit",
                         "checkpoint", "recompute", "band", "tie_group"}
    assert best["to_fit"] is None and best["memory"]["shortfall_bytes"] == 0  # it fits
    assert best.pop("ties") == {"count": 1, "varying": [], "layouts": []}  # no tie at the top
    group = best.pop("tie_group")  # search --json only: the pick and its top tie group
    assert group["picked"] and group["member"] and not ranked[1]["tie_group"]["picked"]
    low, high = best["band"]["step_s"]  # the band holds the prediction
    assert low < best["time"]["step"] < high
    assert {"weights", "gradients", "optimizer", "activations", "other", "total", "capacity",
            "fits"} <= set(best["memory"])
    assert {"tokens_per_s", "model_tflops_per_gpu", "mfu", "hfu"} == set(best["throughput"])
    lay = best["layout"]
    assert lay["tp"] * lay["cp"] * lay["pp"] * lay["dp"] == 512 == gpus and best["memory"]["fits"]
    saved = yaml.safe_load(plan.read_text())
    assert saved["layout"] == lay and saved["gpus"] == 512 and saved["model"]["name"] == "gpt3-175b"
    assert saved["hardware"]["gpu"]["hbm_capacity"] == "81559 MiB"  # nvidia-smi's total
    assert saved["framework"]["name"] == saved["training"]["framework"] == "megatron-core"
    code, out, err = run("estimate", "--plan", str(plan), "--json")
    assert code == 0, err
    again = json.loads(out)
    pipeline = again.pop("pipeline")  # estimate --json only: every pipeline rank
    assert again == best  # the plan reproduces exactly the numbers it was exported with
    ranks = pipeline["ranks"]
    assert [r["rank"] for r in ranks] == list(range(lay["pp"]))
    # the peak over the ranks is the memory total, on the binding rank
    assert max(r["memory_total"] for r in ranks) == pytest.approx(best["memory"]["total"], rel=1e-12)
    assert ranks[pipeline["binding"]]["memory_total"] == max(r["memory_total"] for r in ranks)


def test_export_does_not_overwrite_without_force(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("mine\n")
    code, _, err = run("search", "--model", "175b", "--gpus", "512", "--export", str(plan))
    assert code == 2 and "exists; pass --force" in err
    assert plan.read_text() == "mine\n"
    code, _, err = run("search", "--model", "175b", "--gpus", "512", "--export", str(plan), "--force")
    assert code == 0, err
    assert "layout:" in plan.read_text()


def test_estimate_from_flags_matches_hand_checks():
    code, out, err = run("estimate", "-m", "llama2-7b", "-g", "8", "--tp", "1", "--pp", "1",
                         "--zero-stage", "0", "--json", "--hardware", "dgx-a100-80g",
                         "--global-batch-size", "64", "--seq-length", "4096")
    assert code == 1, err  # it prints the breakdown, and exits 1 because it does not fit
    est = json.loads(out)
    # Llama-2-7B with tp=1, pp=1, V = 32000 (already a multiple of 128): all 6,738,415,616
    # parameters on each GPU; ZeRO-0: 2 B weights, 4 B fp32 grads, 12 B optimizer.
    assert est["memory"]["weights"] == 2 * 6_738_415_616
    assert est["memory"]["gradients"] == 4 * 6_738_415_616
    assert est["memory"]["optimizer"] == 12 * 6_738_415_616
    assert est["layout"]["dp"] == 8 and not est["memory"]["fits"]  # 18 B x 6.7e9 = 121 GB > 80 GiB


@pytest.mark.parametrize("args, code, message", [
    (["search", "--model", "nosuch", "--gpus", "8"], 2, "unknown model 'nosuch'"),
    (["search", "--model", "175b", "--gpus", "8", "--hardware", "tpu"], 2, "unknown hardware profile"),
    (["search", "--model", "175b", "--gpus", "12"], 2, "not a whole number of 8-GPU nodes"),
    (["search", "--model", "175b", "--gpus", "-8"], 2, "must be positive"),
    (["search", "--model", "175b", "--gpus", "abc"], 2, "Invalid value for '--gpus'"),
    (["search", "--model", "175b", "--gpus", "512", "--global-batch-size", "7", "--max-cp", "1"], 2,
     "not divisible by any data-parallel degree"),
    (["search", "--model", "175b", "--gpus", "512", "--seq-length", "0"], 2, "must be positive"),
    (["search", "--model", "175b", "--gpus", "8"], 1, "no layout of gpt3-175b fits"),
    (["search", "--model", "175b"], 2, "missing option --gpus"),
    (["search", "--model", "175b", "--gpus", "512", "--zero-stage", "5"], 2, "--zero-stage must be"),
    (["estimate", "-m", "175b", "-g", "512", "--tp", "3"], 2, "does not divide"),
    (["estimate", "-m", "175b", "-g", "512", "--tp", "16", "--pp", "2"], 2, "tp within the NVLink domain"),
    (["estimate", "--plan", "nosuch.yaml"], 2, "cannot read nosuch.yaml"),
    (["frobnicate"], 2, "No such command"),
    (["search", "--model", "175b", "--gpus", "512", "--tp", "8", "--pp", "8", "--dp", "16"], 2,
     "tp*pp*dp = 8*8*16 = 1,024 > 512 GPUs"),
    (["search", "--model", "175b", "--gpus", "512", "--micro-batch-size", "5"], 2,
     "--micro-batch-size 5 does not divide the per-replica batch"),
    (["search", "--model", "175b", "--gpus", "512", "--tp", "8", "--max-tp", "4"], 2,
     "--tp 8 contradicts --max-tp 4"),
    (["search", "--model", "175b", "--gpus", "512", "--seq-length", "8192"], 2,
     "exceeds the 2048 learned position embeddings"),
    (["search", "--model", "175b", "--gpus", "512", "--seq-length", "100000000"], 2,
     "beyond what plan3d models"),
    # '-' is stdout (tests/test_outputs_and_setup.py), where --json writes too
    (["search", "--model", "175b", "--gpus", "512", "--export", "-", "--json"], 2,
     "--export - and --json both write to stdout"),
    (["search", "--model", "175b", "--gpus", "512", "--export", "."], 2, "--export needs a file name"),
    (["search", "--model", "175b", "--gpus", "512", "--export", "nodir/plan.yaml"], 2,
     "directory nodir does not exist"),
    (["search", "--model", ".", "--gpus", "8"], 2, "is a directory"),
])
def test_bad_input_is_one_line(args, code, message, tmp_path):
    got, out, err = run(*args, cwd=tmp_path)
    assert got == code
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], err
    assert "Traceback" not in err + out


def test_malformed_plan_and_model_files(tmp_path):
    bad = tmp_path / "plan.yaml"
    bad.write_text("layout: [1, 2\n")
    code, _, err = run("estimate", "--plan", str(bad))
    assert code == 2 and "line" in err and "Traceback" not in err
    bad.write_text("plan3d_version: 0.1.0\n")
    code, _, err = run("estimate", "--plan", str(bad))
    assert code == 2 and "missing required field" in err
    model = tmp_path / "m.yaml"
    model.write_text("name: tiny\nsource: test\nnum_layers: 4\nhidden_size: 256\n"
                     "num_attention_heads: 4\nvocab_size: 1000\n"
                     "training: {seq_length: 512, global_batch_size: 32}\n")
    code, out, err = run("search", "--model", str(model), "--gpus", "8", "--top", "1")
    assert code == 0 and "tiny" in out, err


def test_plan_cannot_be_combined_with_flags_and_notes_drift(tmp_path):
    plan = tmp_path / "plan.yaml"
    code, _, err = run("search", "--model", "llama2-7b", "--gpus", "8", "--export", str(plan))
    assert code == 0, err
    code, _, err = run("estimate", "--plan", str(plan), "--tp", "8")
    assert code == 2 and "--plan cannot be combined with --tp" in err
    data = yaml.safe_load(plan.read_text())
    data["estimate"]["time"]["step"] = 1.0
    plan.write_text(yaml.safe_dump(data))
    code, _, err = run("estimate", "--plan", str(plan))
    assert code == 0 and "note: the plan's stored step time 1.00 s differs" in err


def test_bad_files_are_one_line_errors(tmp_path):
    import shutil
    from planner.catalog import catalog_dir
    src = (catalog_dir("models") / "llama2-7b.yaml").read_text()
    cases = {
        "binary.yaml": (b"\x80\x81\xfe" * 50, "is not a UTF-8 text (YAML) file"),
        "empty.yaml": (b"", "is empty"),
        "dup.yaml": ((src + "num_layers: 64\n").encode(), "duplicate key 'num_layers'"),
        "str.yaml": ((src.replace("num_layers: 32", 'num_layers: "32"')).encode(),
                     "num_layers: Input should be a valid integer"),
        "list.yaml": (b"- a\n- b\n", "expected a mapping of fields (name: value), got a list"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        code, out, err = run("search", "--model", str(path), "--gpus", "8")
        assert code == 2 and message in err and "Traceback" not in err, (name, err)
    hw = tmp_path / "hw.yaml"
    shutil.copy(catalog_dir("hardware_profiles") / "dgx-h100.yaml", hw)
    hw.write_text(hw.read_text().replace("bandwidth_per_gpu: 450 GB/s", "bandwidth_per_gpu: 0 GB/s"))
    code, _, err = run("search", "--model", "llama2-7b", "--gpus", "16", "--hardware", str(hw))
    assert code == 2 and "intra_node: bandwidth_per_gpu must be positive" in err, err
    hw.write_text(hw.read_text().replace("0 GB/s", "900 GB"))
    code, _, err = run("search", "--model", "llama2-7b", "--gpus", "16", "--hardware", str(hw))
    assert code == 2 and "intra_node.bandwidth_per_gpu: unknown unit 'GB'" in err, err


def test_version_and_hardware_json_in_si_units():
    from planner import __version__
    code, out, _ = run("--version")
    assert code == 0 and out.strip() == f"plan3d {__version__}"
    code, out, _ = run("hardware", "--json")
    h100 = next(h for h in json.loads(out) if h["name"] == "dgx-h100")
    # 81,559 MiB = 81,559 x 2^20 B; 400 Gb/s = 400e9 / 8 B/s
    assert h100["gpu"]["hbm_capacity"] == 81_559 * 2**20 and h100["inter_node"]["bandwidth_per_nic"] == 50e9
    assert h100["nvlink_domain"] == h100["gpus_per_node"] == 8
    assert h100["host_link"]["bandwidth_per_gpu"] == 64e9  # PCIe Gen5 x16, 128 GB/s both ways / 2
    assert h100["storage"]["per_host"]["write_bandwidth"] == 100e9  # 2 x 400 Gb/s storage NICs
    gb200 = next(h for h in json.loads(out) if h["name"] == "gb200-nvl72")
    assert (gb200["gpus_per_node"], gb200["nvlink_domain"]) == (4, 72)


def test_catalog_listings():
    code, out, _ = run("models")
    assert code == 0 and "gpt3-175b" in out and "llama3-405b" in out
    code, out, _ = run("hardware", "--json")
    names = {h["name"] for h in json.loads(out)}
    assert {"dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "dgx-h200", "dgx-b200"} <= names
