"""The workbook's rule for checked notebook outputs (docs/TESTING.md): text and counts exact, rounded numbers
within one unit of their last printed digit."""
import pytest

from tests.nbval_digits import same_to_last_digit


@pytest.mark.parametrize("ref, test", [
    ("PSNR 52.751 dB", "PSNR 52.750 dB"),                                   # last digit of a rounded number
    ("bias -3.21e-05 [-3.67e-05, -2.72e-05]", "bias -3.20e-05 [-3.66e-05, -2.71e-05]"),
    ("margin +6.92 dB", "margin +6.93 dB"),
    ("kept 97% of full accuracy", "kept 98% of full accuracy"),
    ("max 9.99e-06", "max 1.00e-05"),                                        # the exponent rolls over
    ("M1 holds; 400 questions", "M1 holds; 400 questions"),
])
def test_reads_the_same(ref, test):
    assert same_to_last_digit(ref, test)


@pytest.mark.parametrize("ref, test", [
    ("agree to 4e-06", "agree to 8e-06"),            # four units: the cell prints more than it can guarantee
    ("PSNR 52.751 dB", "PSNR 52.749 dB"),            # two units
    ("400 questions", "401 questions"),              # counts are exact
    ("M1 holds", "M1 inconclusive"),                 # verdicts are text
    ("bound above 0.02", "bound below 0.02"),
    ("0.975", "0.97"),                               # another format is another output
    ("0.975", "0.975 (n=3)"),
    ("kept 97% of it", "kept 0.97 of it"),
])
def test_reads_differently(ref, test):
    assert not same_to_last_digit(ref, test)
