"""Training of nlmfeature models (``nlmfeature train``).

Modules: :mod:`.corpus` (text -> ids), :mod:`.sampling` (alias-method noise),
:mod:`.network` (forward/backward of the hidden layers), :mod:`.estimators` (NCE, class NCE,
softmax/class/tree maximum likelihood, self-normalisation), :mod:`.optim` (AdaGrad with
sparse rows), :mod:`.objective` (the two together) and :mod:`.trainer` (the loop).
"""
