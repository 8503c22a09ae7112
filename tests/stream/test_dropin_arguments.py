"""advise_loader refuses arguments it cannot measure with, before it runs anything, naming the argument."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader

from placer.errors import ArgumentError, ArgumentTypeError, PlacerError
from placer.stream import advise_loader

LOADER = DataLoader(list(range(16)), batch_size=4)


def _never(batch):
    raise AssertionError("the step ran: the arguments were not checked first")


@pytest.mark.parametrize("budget", [-1, 0, math.nan, math.inf, -math.inf])
def test_a_budget_that_is_not_a_finite_positive_number_is_refused(budget):
    with pytest.raises(ArgumentError,
                       match=r"budget_s=.*: budget_s must be a finite number of seconds above 0; e.g. budget_s=60"):
        advise_loader(LOADER, _never, budget_s=budget)


@pytest.mark.parametrize("budget", ["60", None, True, [60]])
def test_a_budget_that_is_not_a_number_is_refused(budget):
    with pytest.raises(ArgumentTypeError, match=r"budget_s must be a number of seconds"):
        advise_loader(LOADER, _never, budget_s=budget)


def test_a_list_of_tensors_is_not_a_loader():
    with pytest.raises(ArgumentTypeError) as e:
        advise_loader([torch.zeros(3), torch.ones(3)], _never)
    assert str(e.value) == ("advise_loader: loader must be a torch.utils.data.DataLoader (got list); "
                            "wrap your data in one: DataLoader(dataset, batch_size=...)")
    assert isinstance(e.value, TypeError) and isinstance(e.value, PlacerError)


def test_a_step_that_is_not_callable_is_refused():
    with pytest.raises(ArgumentTypeError, match=r"step must be callable.*\(got Tensor\)"):
        advise_loader(LOADER, torch.zeros(1))


@pytest.mark.parametrize("batches", [1, 0, -3])
def test_too_few_batches_to_measure_are_refused(batches):
    with pytest.raises(ArgumentError, match=rf"batches={batches}: batches must be at least 2; a run reads"):
        advise_loader(LOADER, _never, batches=batches)


@pytest.mark.parametrize("epochs", [0, -1])
def test_epochs_below_one_are_refused(epochs):
    with pytest.raises(ArgumentError, match=rf"epochs={epochs}: epochs must be at least 1"):
        advise_loader(LOADER, _never, epochs=epochs)


@pytest.mark.parametrize("name", ["batches", "epochs"])
def test_counts_that_are_not_whole_numbers_are_refused(name):
    with pytest.raises(ArgumentTypeError, match=rf"{name}=2.5: {name} must be a whole number \(got float\)"):
        advise_loader(LOADER, _never, **{name: 2.5})


def test_the_errors_are_value_and_type_errors():
    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, PlacerError)
    assert issubclass(ArgumentTypeError, TypeError)
