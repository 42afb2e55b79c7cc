"""The normalized tied output layer (Liu, Zhai & Chen 2020): the head modes (``modes``), what a mode returns, checked
(``mode_checks``), the head's options and learned terms (``options``), the layer that scores with them (``layer``),
the lossless start (``lossless_start``), the folded weight and row norms (``folded_weight``), the adaptive softmax
(``adaptive``), and the guards that keep PEFT and replaced forwards from bypassing it (``peft_guard``,
``scoring_guard``). Imports nothing else of the model layer."""
