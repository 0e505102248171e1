"""``_offline/scoped.py``: a block's changes to a module, class or mapping are undone exactly."""

from __future__ import annotations

import types

import pytest

from vllm_staging_plugin._offline.scoped import attributes, items, kept


def test_values_hold_inside_the_block_and_the_old_ones_come_back() -> None:
    target = types.SimpleNamespace(a=1, b="x")
    with attributes(target, {"a": 2, "b": None}):
        assert (target.a, target.b) == (2, None)
    assert vars(target) == {"a": 1, "b": "x"}


def test_an_error_in_the_block_still_restores_and_propagates() -> None:
    target = types.SimpleNamespace(a=1)
    with pytest.raises(KeyError), attributes(target, {"a": 2}):
        raise KeyError("inside")
    assert target.a == 1


def test_a_class_gets_back_its_own_entry_and_an_inherited_one_shows_through() -> None:
    class Base:
        inherited = "base"

        @classmethod
        def own(cls) -> str:
            return "own"

    class Child(Base):
        @classmethod
        def own(cls) -> str:
            return "child"

    entry = vars(Child)["own"]
    with attributes(Child, {"own": classmethod(lambda cls: "patched"), "inherited": "child's"}):
        assert (Child.own(), Child.inherited) == ("patched", "child's")
    assert vars(Child)["own"] is entry and Child.own() == "child"  # the classmethod object itself
    assert "inherited" not in vars(Child) and Child.inherited == "base"


def test_mapping_items_come_back_and_new_ones_go() -> None:
    mapping = {"kept": "1", "removed": "2"}
    with items(mapping, {"kept": "3", "removed": None, "added": "4"}):
        assert mapping == {"kept": "3", "added": "4"}
    assert mapping == {"kept": "1", "removed": "2"}
    with pytest.raises(RuntimeError), items(mapping, {"added": "5"}):
        raise RuntimeError
    assert mapping == {"kept": "1", "removed": "2"}


def test_a_kept_mapping_loses_what_the_block_added_and_gets_back_what_it_changed_or_removed() -> None:
    mapping = {"same": "1", "changed": "2", "removed": "3"}
    with pytest.raises(RuntimeError), kept(mapping):
        mapping.update(changed="x", added="y")
        del mapping["removed"]
        raise RuntimeError
    assert mapping == {"same": "1", "changed": "2", "removed": "3"}
