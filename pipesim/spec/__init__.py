"""Validated input models (Profile, Topology, Plan) and their readers and writers."""

from pipesim.spec.files import load_plan, load_profile, load_topology, save_model
from pipesim.spec.plan import Plan
from pipesim.spec.profile import Layer, Profile, uniform_profile
from pipesim.spec.topology import Device, Level, Link, Topology

__all__ = [
    "Device",
    "Layer",
    "Level",
    "Link",
    "Plan",
    "Profile",
    "Topology",
    "load_plan",
    "load_profile",
    "load_topology",
    "save_model",
    "uniform_profile",
]
