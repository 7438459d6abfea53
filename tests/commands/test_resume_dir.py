"""A run that resumes nothing never writes into an earlier run's files (rlfarm/commands/resume.py: fresh_run_dir):
`resume=auto` in a directory whose run wrote no checkpoint starts over beside it, and says where."""
import logging

from rlfarm.commands.resume import fresh_run_dir


def earlier_run(directory):
    (directory / "checkpoints").mkdir(parents=True)
    (directory / "config.yaml").write_text("seed: 1\n")
    (directory / "metrics.jsonl").write_text('{"env_steps": 960}\n')
    (directory / ".hydra").mkdir(exist_ok=True)
    (directory / ".hydra" / "overrides.yaml").write_text("- resume=auto\n")
    return directory


def test_a_new_directory_is_only_for_a_directory_that_holds_a_run(tmp_path):
    assert fresh_run_dir(str(tmp_path / "new")) == str(tmp_path / "new")
    (tmp_path / "hydra_only" / ".hydra").mkdir(parents=True)  # what Hydra writes before the run starts
    assert fresh_run_dir(str(tmp_path / "hydra_only")) == str(tmp_path / "hydra_only")


def test_an_earlier_run_without_a_checkpoint_is_left_as_it_is(tmp_path, caplog):
    old = earlier_run(tmp_path / "run")
    log_file = logging.FileHandler(old / "train.log")
    logging.getLogger().addHandler(log_file)
    try:
        with caplog.at_level(logging.WARNING, logger="rlfarm"):
            new = fresh_run_dir(str(old))
        logging.getLogger("rlfarm").warning("after the move")
    finally:
        for handler in [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)
                        and h.baseFilename.startswith(str(tmp_path))]:
            logging.getLogger().removeHandler(handler)
            handler.close()
    assert new == f"{old}-2" and f"this run starts over in {new}" in caplog.text
    assert (old / "metrics.jsonl").read_text() == '{"env_steps": 960}\n'  # nothing appended to it
    assert (tmp_path / "run-2" / ".hydra" / "overrides.yaml").exists()  # so resume=<new dir> finds its overrides
    assert "after the move" in (tmp_path / "run-2" / "train.log").read_text()
    assert "after the move" not in (old / "train.log").read_text()
    earlier_run(tmp_path / "run-2")
    assert fresh_run_dir(str(old)) == f"{old}-3"
