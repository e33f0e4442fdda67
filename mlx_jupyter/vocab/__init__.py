"""The package's vocabulary, at the bottom of its layers: what every other layer names and none defines
again. Each backend's record, the rank's environment contract, CPU binding, a rank's record, host and
port rules, numeric limits and every cluster option. It imports nothing else of ours
(``tests/test_structure.py``), so the rank side, the launcher and the faces all import it downward.
"""
