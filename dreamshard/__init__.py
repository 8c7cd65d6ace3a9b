"""DreamShard (NeurIPS 2022): a cost network and a placement policy trained in an estimated MDP.

Modules: ``config`` (every hyper-parameter), ``networks`` (cost and policy networks), ``env`` (the
estimated MDP), ``trainer`` (measure → fit cost network → REINFORCE → checkpoint), ``sharder``
(inference and checkpoints).
"""
