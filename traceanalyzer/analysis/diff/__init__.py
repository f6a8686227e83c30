"""The diff family: two runs compared (``compare``), kernels matched (``kernel_match``) and the step change
attributed (``attribution``)."""
