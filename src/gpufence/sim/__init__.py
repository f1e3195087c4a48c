"""Trace-driven simulator: a virtual clock drives the same scheduler core as the control plane.

Entry points: ``sim.experiment.run_experiment`` (policies x seeds -> metrics.json with advice)
over ``sim.inputs`` (a scenario or trace, one seed at a time), written by ``sim.outputs``;
``sim.policy_run.run_policy`` is one policy's run, ``sim.runner.Simulation`` the engine, and
``sim.workloads`` the trace loaders and the workload records they produce (data only: they never
import the engine). Nothing is imported here, so reading a trace stays light.
"""
