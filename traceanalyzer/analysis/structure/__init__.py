"""Structure: steps (``steps``, ``step_detect``, ``pass_grammar``) and layers (``layers``, ``layer_pattern``)."""
