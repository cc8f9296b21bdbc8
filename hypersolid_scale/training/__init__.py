"""The training application: the loop and the set-up order (``trainer``, behind ``launch/train.py``), when
to save and the collective save (``checkpointer``), building a run (``run_builder``), the optimizer and its
schedule (``optim``), the loop's sync-free step bookkeeping (``step_bookkeeping``: non-finite guard, stop
vote, epoch meter) and what a run reports besides its step statistics (``epoch_report``: online kNN
monitor, loader counters, memory, loss plot).

``optim`` sits in a lower layer than the rest (the config tree holds its ``optim`` section); this file
imports nothing, so importing it pulls in nothing of the trainer.
"""
