"""Tasks: the local computation of a node (sum, mean, histogram, logistic regression, user classes)."""

from hushnet.tasks.base import GradientTask, Task, TaskError, UnknownTask, ValueTask
from hushnet.tasks.data import (
    DataFileMissing,
    DataShapeError,
    Partition,
    houses_partition,
    load_local_data,
    partition,
    stratified_split,
)
from hushnet.tasks.logistic import LogisticRegressionTask, logistic_metrics
from hushnet.tasks.registry import BUILTIN_TASKS, make_task, resolve_task_class
from hushnet.tasks.values import HistogramTask, MeanTask, SumTask

__all__ = [
    "GradientTask",
    "Task",
    "TaskError",
    "UnknownTask",
    "ValueTask",
    "DataFileMissing",
    "DataShapeError",
    "Partition",
    "houses_partition",
    "load_local_data",
    "partition",
    "stratified_split",
    "LogisticRegressionTask",
    "logistic_metrics",
    "BUILTIN_TASKS",
    "make_task",
    "resolve_task_class",
    "HistogramTask",
    "MeanTask",
    "SumTask",
]
