"""Drivers that run a paper's official code from a checkout beside ours (`--official_repo`)."""
