"""The normalized tied output layer (Liu, Zhai & Chen 2020): the head's settings and the registries of its modes and
terms, without torch (``settings``), the head modes (``modes``), the learned terms (``terms``), the layer that scores
with them (``layer``), the folded weight and row norms (``folded_weight``), the adaptive softmax (``adaptive``), and
the guards that keep PEFT and replaced forwards from bypassing it (``peft_guard``, ``scoring_guard``). Imports nothing
else of the model layer."""
