"""Consumer groups on the control plane."""

from riverbed.log.group.assignors import ASSIGNORS, Assignor, TopicPartition
from riverbed.log.group.consumer import Consumer, GroupDescription, PartitionState, describe_group

__all__ = [
    "ASSIGNORS",
    "Assignor",
    "Consumer",
    "GroupDescription",
    "PartitionState",
    "TopicPartition",
    "describe_group",
]
