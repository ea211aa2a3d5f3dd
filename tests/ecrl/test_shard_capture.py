"""The fast capture of a sharded model's own shards (``FullStates._shards``): an object's own
``state_dict`` stands for torch's ``get_*_state_dict`` only once a renaming is proved to give
exactly torch's values — the same tensors' storages and the same other values."""

from __future__ import annotations

import numpy as np
import torch

from ecrl.runtime.checkpoint.dtensor import _learn_translation


def test_a_model_state_with_the_same_names_and_storages_is_taken_as_it_is() -> None:
    weight, bias = torch.ones(4, 2), torch.zeros(4)
    plain = {"fc.weight": weight.detach(), "fc.bias": bias.detach()}
    translate = _learn_translation(plain, {"fc.bias": bias, "fc.weight": weight})
    assert translate is not None and translate(plain) is plain


def test_an_optimizer_state_is_renamed_from_parameter_indices_to_names() -> None:
    moment = torch.zeros(3)
    plain = {"state": {0: {"momentum_buffer": moment}},
             "param_groups": [{"lr": 0.1, "momentum": 0.9, "params": [0, 1]}]}
    wanted = {"state": {"fc.weight": {"momentum_buffer": moment}},
              "param_groups": [{"lr": 0.1, "momentum": 0.9, "params": ["fc.weight", "fc.bias"]}]}
    translate = _learn_translation(plain, wanted)
    assert translate is not None
    # later states are renamed the same way, with their own values (a scheduler's new lr)
    later = {"state": {1: {"momentum_buffer": moment}, 0: {"momentum_buffer": moment}},
             "param_groups": [{"lr": 0.05, "momentum": 0.9, "params": [0, 1]}]}
    assert translate(later) == {
        "state": {"fc.bias": {"momentum_buffer": moment},
                  "fc.weight": {"momentum_buffer": moment}},
        "param_groups": [{"lr": 0.05, "momentum": 0.9, "params": ["fc.weight", "fc.bias"]}]}


def test_anything_but_a_proven_renaming_keeps_torchs_functions() -> None:
    moment = torch.zeros(3)
    plain = {"state": {0: {"momentum_buffer": moment}},
             "param_groups": [{"lr": 0.1, "params": [0]}]}
    # another value, another tensor (a copy, not the same storage), another layout of groups
    assert _learn_translation(plain, {"state": {"w": {"momentum_buffer": moment}},
                                      "param_groups": [{"lr": 0.2, "params": ["w"]}]}) is None
    assert _learn_translation(plain, {"state": {"w": {"momentum_buffer": moment.clone()}},
                                      "param_groups": [{"lr": 0.1, "params": ["w"]}]}) is None
    assert _learn_translation(plain, {"state": {"w": {"momentum_buffer": moment}},
                                      "param_groups": [{"lr": 0.1, "params": ["w", "v"]}]}) is None
    weight = torch.ones(2)
    assert _learn_translation({"w": weight}, {"w": weight.clone()}) is None
    assert _learn_translation({"w": weight}, {"w": weight, "extra": weight}) is None
    # a value whose == is not a truth (an array) is no proof either, and raises nothing
    assert _learn_translation({"a": np.zeros(2)}, {"a": np.zeros(2)}) is None
