"""`python -m experiments.list` shows every registered method that has a config, with its variants."""

import subprocess
import sys

from configs import quant_diffusion
from experiments import list as listing


def test_every_method_with_a_config_is_listed_with_variants_and_a_claim():
  rows = {name: (title, variants, claim) for name, title, variants, claim in listing.rows()}
  for name in ("quant_diffusion", "dcd_ssm", "frontdoor", "lm"):
    title, variants, claim = rows[name]
    assert "default" in variants and title and claim, name
  assert rows["quant_diffusion"][0].startswith("QDPM")


def test_module_prints_one_block_per_method():
  out = subprocess.run(
    [sys.executable, "-m", "experiments.list"], capture_output=True, text=True, check=True
  ).stdout
  assert f"quant_diffusion  [{', '.join(quant_diffusion.VARIANTS)}]" in out
  assert "python experiments/train.py --config=configs/lm.py" in out
