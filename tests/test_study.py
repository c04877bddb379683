"""The study runner checks every arm before the first one runs; optional baselines follow one rule."""

import dataclasses
import importlib.util
import json

import pytest

import methods
from experiments import loop, studies
from methods.base import ConfigError, Report, with_changes

methods.register("toy", "toy_method")
import toy_method  # noqa: E402


@pytest.fixture
def toy_study(monkeypatch):
  """The toy method with a study of three arms whose last one `bad_last` may break."""

  def arms(config):
    good = [(f"lr{lr:g}", with_changes(config, learning_rate=lr)) for lr in (0.1, 0.05)]
    return good + [("last", with_changes(config, batch_size=config.bad_last_batch_size))]

  def report(config, results):
    return Report(rows=[{"arm": name, **r} for name, r in results.items()])

  study_method = dataclasses.replace(toy_method.METHOD, study_arms=arms, report=report)
  monkeypatch.setattr(toy_method, "METHOD", study_method)
  config = toy_method.get_config()
  config.steps = 2
  config.bad_last_batch_size = 8
  return config


def test_invalid_last_arm_fails_before_the_first_arm_runs(toy_study, tmp_path):
  toy_study.bad_last_batch_size = 0
  with pytest.raises(ConfigError, match=r"^study arm 'last': config.batch_size: must be positive"):
    studies.run_study(toy_study, str(tmp_path))
  assert list(tmp_path.iterdir()) == []


def test_valid_study_runs_every_arm(toy_study, tmp_path):
  payload = studies.run_study(toy_study, str(tmp_path))
  assert [row["arm"] for row in payload["rows"]] == ["lr0.1", "lr0.05", "last"]


def test_repeated_arm_names_are_refused(toy_study, tmp_path, monkeypatch):
  method = toy_method.METHOD
  twice = lambda config: [("a", config), ("a", config)]
  monkeypatch.setattr(toy_method, "METHOD", dataclasses.replace(method, study_arms=twice))
  with pytest.raises(ConfigError, match=r"names \['a'\] are used more than once"):
    studies.run_study(toy_study, str(tmp_path))
  assert list(tmp_path.iterdir()) == []


_EXTRA_INSTALLED = all(
  importlib.util.find_spec(m) is not None for m in ("econml", "doubleml", "fd_cate")
)


@pytest.mark.skipif(_EXTRA_INSTALLED, reason="the optional front-door extra is installed here")
def test_study_skips_a_missing_optional_baseline_and_says_how_to_enable_it():
  from configs import frontdoor as frontdoor_config
  from methods import frontdoor

  config = frontdoor_config.get_config("study")
  arms = dict(frontdoor.study_arms(config))
  assert "external" not in arms
  studies.check_arms(list(arms.items()))
  note = frontdoor.external_note(config)
  assert note.startswith("External baselines run: none (skipped: ['doubleml', 'econml', 'fdcate']")
  assert frontdoor.EXTRA_INSTALL in note


@pytest.mark.skipif(_EXTRA_INSTALLED, reason="the optional front-door extra is installed here")
def test_a_run_asking_for_a_missing_baseline_fails_at_validation():
  from configs import frontdoor as frontdoor_config
  from methods import frontdoor

  config = frontdoor_config.get_config()
  config.external = ("econml",)
  with pytest.raises(ConfigError, match=r"config.external: \['econml'\] need the optional extra"):
    frontdoor.validate(config)


def _report_files(workdir):
  payload = json.loads((workdir / "results.json").read_text())
  return payload, (workdir / "results.md").read_text()


def test_two_shards_and_report_only_give_the_sequential_report(toy_study, tmp_path):
  studies.run_study(toy_study, str(tmp_path / "sequential"))
  sharded = tmp_path / "sharded"
  assert studies.run_study(toy_study, str(sharded), shard=(1, 2)) is None  # arm 0 and 2 outstanding
  assert sorted(p.name for p in sharded.iterdir()) == ["lr0.05"]
  studies.run_study(
    toy_study, str(sharded), shard=(0, 2)
  )  # finishes the last arms: writes the report
  (sharded / "results.json").unlink()
  studies.run_study(toy_study, str(sharded), report_only=True)
  assert _report_files(sharded) == _report_files(tmp_path / "sequential")


def test_report_only_names_the_missing_arms(toy_study, tmp_path):
  studies.run_study(toy_study, str(tmp_path), shard=(0, 3))
  with pytest.raises(studies.StudyIncomplete, match=r"not finished in .*: lr0.05, last;"):
    studies.run_study(toy_study, str(tmp_path), report_only=True)


def test_interrupted_arm_resumes_and_finished_arms_are_not_rerun(toy_study, tmp_path):
  studies.run_study(toy_study, str(tmp_path / "uninterrupted"))
  workdir = tmp_path / "interrupted"
  stop_in_second_arm = lambda phase, step: phase == "fit" and step == 1 and len(_arms(workdir)) == 2
  with pytest.raises(loop.Interrupted):
    studies.run_study(toy_study, str(workdir), should_stop=stop_in_second_arm)
  assert not (workdir / "lr0.05" / "results.json").exists()
  first_arm_rows = (workdir / "lr0.1" / "metrics.jsonl").read_text()
  studies.run_study(toy_study, str(workdir))
  assert (workdir / "lr0.1" / "metrics.jsonl").read_text() == first_arm_rows  # not run again
  assert _report_files(workdir) == _report_files(tmp_path / "uninterrupted")


def _arms(workdir):
  return [p for p in workdir.iterdir() if p.is_dir()] if workdir.exists() else []


def test_shard_flag_is_checked():
  assert studies.parse_shard("1/4") == (1, 4)
  for text in ("4/4", "-1/2", "1", "a/b"):
    with pytest.raises(ValueError, match="--shard must be I/N"):
      studies.parse_shard(text)
