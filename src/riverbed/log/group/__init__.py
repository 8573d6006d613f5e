"""Consumer groups on the control plane."""

from riverbed.log.group.assignors import ASSIGNORS, Assignor, TopicPartition
from riverbed.log.group.consumer import Consumer, GroupDescription, PartitionState, describe_group
from riverbed.log.group.transform import transform

__all__ = [
    "ASSIGNORS",
    "Assignor",
    "Consumer",
    "GroupDescription",
    "PartitionState",
    "TopicPartition",
    "describe_group",
    "transform",
]
