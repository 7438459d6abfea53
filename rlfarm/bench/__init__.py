"""`rlfarm bench <name>`: one module per bench (labeler, learner, engine, sync, pipeline, vla, env, maniskill), each
with `run(cfg, device) -> rows`; rlfarm/bench/common.py adds the ratios, writes bench.json and prints the table."""
