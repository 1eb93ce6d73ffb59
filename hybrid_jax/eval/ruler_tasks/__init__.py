"""RULER task families: each builds one sample for a given haystack size; `hybrid_jax.eval.ruler` drives them."""

from hybrid_jax.eval.ruler_tasks.common_words import CommonWords
from hybrid_jax.eval.ruler_tasks.freq_words import FreqWords
from hybrid_jax.eval.ruler_tasks.niah import Niah
from hybrid_jax.eval.ruler_tasks.qa import QA
from hybrid_jax.eval.ruler_tasks.variable_tracking import VariableTracking

FAMILIES = {
    'niah': Niah,
    'variable_tracking': VariableTracking,
    'common_words_extraction': CommonWords,
    'freq_words_extraction': FreqWords,
    'qa': QA,
}
