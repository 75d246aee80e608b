"""Helpers for tests, CI and audits of a run's output; not on any command's path.

:mod:`chainrows.testing.reconcile`: does a run's ``rows``/``report`` agree with its input
(nothing lost, nothing invented, every generation trained once)?"""
