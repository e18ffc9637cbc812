"""kvtop's commands, one module each, each with ``main(argv) -> int`` (kvtop/cli.py dispatches to them):

    kvtop [options]                   drive a workload through an engine and watch its KV cache tiers
    kvtop sim --trace FILE ...        replay a Mooncake trace on the simulator as fast as possible (sweeps)
    kvtop attach URL                  watch a run elsewhere: vllm://, sglang://, zmq://, http:// (trtllm-serve),
                                      mqtt://, FILE.jsonl
    kvtop replay FILE [--speed X]     replay a recording
    kvtop agent URL --mqtt mqtt://... fold a local source, publish per-source summaries (fleets)
    kvtop estimate ...                reload vs recompute arithmetic for a model on a GPU
    kvtop calibrate ...               measure this machine's GPU into a profile
    kvtop report RUN.jsonl ... -o DIR charts and a summary page from recordings

(run.py is the first line, the driven run). The commands are the top of the house: nothing below them imports
them (tests/test_layers.py). A bad option raises kvtop.options.UsageError or kvtop.settings.SettingsError, which
kvtop/cli.py prints as one line naming it (exit 2); nothing prints a traceback for bad input.
"""
