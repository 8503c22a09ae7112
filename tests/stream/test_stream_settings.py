"""Stream settings have one owner: :class:`placer.data.stream.StreamSettings`, held by plans and candidates
and taken by the runner, and :class:`placer.data.stream.LoaderSettings` in a DataLoader's own terms."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from placer.data.documents import json_schema
from placer.data.stream import LoaderSettings, StreamPlan, StreamSettings
from placer.stream import StreamConfig
from placer.stream.planner import make, plan_from_profile, stream_config
from tests.stream.test_stream_plan import RULE, synthetic

#: the plan's saved fields, as they were before the settings had one owner
SAVED = ["pipeline", "source", "step", "objective", "epochs", "placement", "workers", "stage_workers",
         "worker_kind", "prefetch", "pin_memory", "cache", "torch_threads", "predicted_samples_per_s",
         "predicted_total_s", "bottleneck", "consumer_samples_per_s", "stages", "reasons", "baselines", "what_if",
         "verified", "candidates", "search", "notes", "profile_s", "planning_s"]


def test_the_runner_config_is_the_settings_model():
    assert StreamConfig is StreamSettings


@pytest.mark.parametrize("kind", ["thread", "process", "dask"])
def test_a_saved_plan_of_every_worker_kind_reloads(kind):
    plan, _, _ = plan_from_profile(synthetic())
    plan.settings = plan.settings.override(worker_kind={"decode": kind}, stage_workers={"decode": 3})
    for d in plan.stages:
        if d.name == "decode":
            d.worker_kind = kind
    text = plan.to_json()
    saved = json.loads(text)
    assert list(saved) == SAVED  # flat, as before: no nested "settings"
    assert saved["worker_kind"] == {"decode": kind} and saved["stage_workers"] == {"decode": 3}
    back = StreamPlan.model_validate_json(text)
    assert back == plan and back.settings.kind_of("decode") == kind
    assert back.to_json() == text
    assert stream_config(back).kind_of("decode") == kind
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the test extra) validates against schemas")
    jsonschema.Draft202012Validator(json_schema("stream-plan")).validate(saved)


def test_the_schema_lists_the_settings_flat_and_knows_every_worker_kind():
    props = json_schema("stream-plan")["properties"]
    # a plan for a described machine (``--target``) also has its target's fields, a plan with a cluster
    # its batches per task and offload, a source whose workers are kept between epochs its persistent_workers, and
    # a step in a lower precision its precision fields, left out when unset
    at = SAVED.index("torch_threads") + 1
    with_group = SAVED[:at] + ["stage_group", "persistent_workers"] + SAVED[at:]
    assert "settings" not in props and list(props) == with_group + ["target", "target_sentence",
                                                                      "predicted_wait_fraction", "offload",
                                                                      "precision", "precision_s", "precision_checks"]
    assert props["worker_kind"]["additionalProperties"]["enum"] == ["thread", "process", "dask"]
    assert "cache_bytes" not in props and "max_batches" not in props  # limits of one run, not plan decisions


def test_a_plan_reads_flat_settings_and_keeps_run_limits_out_of_its_file():
    plan = StreamPlan(pipeline="p", source="s", step="t", workers=0, cache="s", torch_threads=2)
    assert plan.settings.sequential and plan.settings.cache == "s" and plan.settings.torch_threads == 2
    plan.settings = plan.settings.override(max_batches=5)
    assert "max_batches" not in json.loads(plan.to_json())
    with pytest.raises(ValidationError, match="worker_kind"):
        StreamPlan(pipeline="p", source="s", step="t", worker_kind={"a": "fork"})


def test_override_validates_and_names_the_field():
    s = StreamSettings(workers=2)
    assert s.override(prefetch=4) == StreamSettings(workers=2, prefetch=4)
    assert s.override() is s
    with pytest.raises(ValidationError, match="prefetch"):
        s.override(prefetch=0)


def test_merging_the_settings_of_several_streams():
    a = StreamSettings(stage_workers={"decode": 3}, worker_kind={"decode": "process"}, prefetch=3, cache="decode")
    b = StreamSettings(stage_workers={"parse": 2}, pin_memory=False, torch_threads=2)
    both = StreamSettings.merge([a, b])
    assert both.stage_workers == {"decode": 3, "parse": 2} and both.worker_kind == {"decode": "process"}
    assert (both.workers, both.prefetch, both.pin_memory, both.cache, both.torch_threads) == (1, 3, False,
                                                                                             "decode", 2)
    seq = StreamSettings(workers=0)
    assert StreamSettings.merge([seq, seq]).sequential and not StreamSettings.merge([seq, a]).sequential


def test_several_plans_give_one_config_with_extra_fields_on_top():
    plan, _, _ = plan_from_profile(synthetic())
    cfg = stream_config([plan, plan], max_batches=7)
    assert cfg.max_batches == 7 and cfg.stage_workers == plan.settings.stage_workers


def test_candidates_are_equal_whatever_the_order_of_their_mappings():
    place = tuple(RULE.items())
    a = make(place, {"decode": 2, "augment": 1}, processes=("decode",))
    b = make(place, {"augment": 1, "decode": 2}, processes=("decode",))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != make(place, {"decode": 2, "augment": 1})
    assert a.settings.prefetch == 2 and make(place, {"decode": 5}).settings.prefetch == 5


def test_loader_settings_convert_to_and_from_stream_settings():
    lo = LoaderSettings(num_workers=4, prefetch_factor=3, pin_memory=True, torch_threads=2)
    s = lo.to_stream("images")
    assert (s.workers_of("images"), s.prefetch, s.pin_memory, s.torch_threads) == (4, 3, True, 2)
    assert LoaderSettings.from_stream(s, "images") == lo
    assert LoaderSettings.from_stream(s.override(workers=0), "images").num_workers == 0  # one batch at a time
    none = LoaderSettings.from_stream(StreamSettings(), "images")
    assert none.num_workers == 0 and none.prefetch_factor is None and none.kwargs() == {"num_workers": 0,
                                                                                       "pin_memory": True}


def test_loader_settings_read_a_dataloader():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    lo = LoaderSettings.of(DataLoader(list(range(8)), batch_size=2, num_workers=2, prefetch_factor=3,
                                      persistent_workers=True))
    assert (lo.num_workers, lo.prefetch_factor, lo.pin_memory, lo.persistent_workers) == (2, 3, False, True)
    assert LoaderSettings.of(DataLoader(list(range(8)))) == LoaderSettings()
    assert torch is not None


def test_one_plans_config_is_its_own_settings():
    for prof in (synthetic(), synthetic(cores=1, epochs=5, batches=10)):
        plan, _, _ = plan_from_profile(prof)
        assert stream_config(plan) == plan.settings


def test_loader_settings_as_dict_shows_the_advices_terms_without_the_batch_size():
    """The drop-in's recommended settings as a dict, as scripts read them (``advice.recommended.settings``)."""
    d = LoaderSettings(num_workers=2, prefetch_factor=4, torch_threads=1, batch_size=64).as_dict()
    assert d == {"num_workers": 2, "prefetch_factor": 4, "pin_memory": False, "persistent_workers": False,
                 "torch_threads": 1, "worker_threads": False, "worker_kind": "processes"}
    assert LoaderSettings().as_dict()["worker_kind"] == "main process"
    threads = LoaderSettings(num_workers=2, prefetch_factor=4, worker_threads=True)
    assert threads.worker_kind == "threads" and threads.kwargs() == {"num_workers": 2, "pin_memory": False,
                                                                    "prefetch_factor": 4}
