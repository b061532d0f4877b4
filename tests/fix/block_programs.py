"""with-block programs for tests/fix/test_block.py."""

import torch

import gradsan.torch as gst

MODEL = torch.nn.Linear(2, 1)


def plain_block(x):
    with gst.explain() as report:
        h = torch.sqrt(x) * 0.0  # L:block-sqrt
        loss = (h * 2.0).sum() + x.sum()
        loss.backward()
    return report


def block_with_model(x):
    with gst.explain() as report:
        h = torch.sqrt(x) * 0.0
        loss = MODEL(h).sum()
        loss.backward()
    return report


def block_reassigning_its_input(x):
    with gst.explain() as report:
        x = torch.sqrt(x) * 0.0
        loss = x.sum()
        loss.backward()
    return report


def sanitize_block(x):
    with gst.sanitize() as report:
        loss = torch.relu(x).sum()
        loss.backward()
    return report
