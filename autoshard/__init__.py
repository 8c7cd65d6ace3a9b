"""AutoShard (KDD 2022): an LSTM policy trained actor-learner style (IMPALA, V-trace) on rewards
measured on real hardware, with a cost model learned online from the measured shards."""
