"""Reading users' objects leaves them as fast as they were (placer.attrs, the digest, profile keys).

On CPython 3.11 and 3.12, reading an object's ``__dict__`` once builds a real dict in place
of its compact attributes for good, and every later ``self.x`` takes a slower path (a
tokenizer's inner loop ran 11 % slower). Whether the dict was built shows in the garbage
collector's view: the attribute values themselves, or one dict holding them.
"""

from __future__ import annotations

import gc

from placer.attrs import attribute_values
from placer.digest import outputs_digest
from placer.profile.keys import stage_fingerprint
from placer.pipeline import Pipeline


class Tokenizer:
    def __init__(self, words):
        self.itos = list(words)
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    def __call__(self, text):
        return [self.stoi.get(w, 0) for w in text.split()]


def _dict_built(obj) -> bool:
    refs = [r for r in gc.get_referents(obj) if r is not type(obj)]
    return len(refs) == 1 and isinstance(refs[0], dict) and set(refs[0]) == {"itos", "stoi"}


def test_attribute_values_reads_values_in_order_without_building_the_dict():
    tok = Tokenizer(["a", "b"])
    assert not _dict_built(tok)
    assert attribute_values(tok) == [["a", "b"], {"a": 0, "b": 1}]
    assert not _dict_built(tok)
    vars(tok)  # what placer used to do: the dict is built from here on
    assert _dict_built(tok)
    assert attribute_values(tok) == [["a", "b"], {"a": 0, "b": 1}], "the same values once the dict is built"


def test_an_only_attribute_that_is_a_dict_is_a_value_not_the_objects_dict():
    class Holder:
        def __init__(self):
            self.table = {1: "x"}  # not str keys: cannot be the object's own __dict__

    assert attribute_values(Holder()) == [{1: "x"}]
    assert attribute_values(3) is None and attribute_values([1]) is None and attribute_values(Tokenizer) is None


def test_digesting_an_output_does_not_build_its_dict_and_still_sees_its_content():
    tok = Tokenizer(["a", "b"])
    d = outputs_digest({"tok": tok})
    assert not _dict_built(tok)
    built = Tokenizer(["a", "b"])
    vars(built)
    assert outputs_digest({"tok": built}) == d, "a built dict digests as the values it holds"
    assert outputs_digest({"tok": Tokenizer(["a", "c"])}) != d


def test_a_callable_objects_profile_key_does_not_build_its_dict_and_follows_its_data():
    tok = Tokenizer(["a", "b"])
    p = Pipeline("keys")
    p.add(name="tokenize", kind="preprocessing", cpu=tok)
    key = stage_fingerprint(p.stages["tokenize"])
    assert not _dict_built(tok)
    q = Pipeline("keys")
    q.add(name="tokenize", kind="preprocessing", cpu=Tokenizer(["a", "z"]))
    assert stage_fingerprint(q.stages["tokenize"]) != key
