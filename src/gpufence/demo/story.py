"""The demo's story, written once: its acts, their titles and what each shows.

``gpufence demo`` tells it on the live control plane with real processes (``live.py``), and
``gpufence demo --simulated`` tells it in the simulator on a virtual clock (``simulated.py``);
each telling takes its headings and its opening lines from here, so the two cannot drift apart.
What differs is only the stage: this machine's GPUs for the live demo (any number: 1, 2, 4, 8, 16
...; 8 fake ones where it has none), the shipped example clusters for the simulated one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Act:
    number: int
    title: str
    shows: str
    """What the act shows, in one sentence (printed as it starts)."""

    @property
    def heading(self) -> str:
        return f"act {self.number} - {self.title}"

    def step(self, what: str) -> str:
        """A progress label for one stage of the act."""
        return f"act {self.number}: {what}"


SEED_CASE = Act(
    1,
    "the seed's 66-job case",
    "66 one-GPU training jobs on N GPUs (the machine's, or the simulator's 8): the excess queues, "
    "every job completes, no GPU ever runs two jobs, and the makespan stays close to "
    "ceil(66 / N) rounds.",
)
SERVING_SURGE = Act(
    2,
    "a fenced cluster through a serving surge",
    "serving replicas inside their fence, a checkpointing training gang, a notebook that goes "
    "idle and is reclaimed, then a serving surge that finds the fence full: one budgeted "
    "incident preemption of the checkpointable gang (notice -> ack -> requeue -> resume).",
)
STORY = (SEED_CASE, SERVING_SURGE)
