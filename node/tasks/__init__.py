"""Tasks: the local computation of a node (sum, mean, histogram, logistic regression, user classes)."""
from node.tasks.base import GradientTask, Task, TaskError, UnknownTask, ValueTask
from node.tasks.data import (
    DataFileMissing,
    DataShapeError,
    Partition,
    houses_partition,
    load_local_data,
    partition,
    stratified_split,
)
from node.tasks.logistic import LogisticRegressionTask, logistic_metrics
from node.tasks.registry import BUILTIN_TASKS, make_task, resolve_task_class
from node.tasks.values import HistogramTask, MeanTask, SumTask

__all__ = [
    "GradientTask", "Task", "TaskError", "UnknownTask", "ValueTask", "DataFileMissing", "DataShapeError",
    "Partition", "houses_partition", "load_local_data", "partition", "stratified_split",
    "LogisticRegressionTask", "logistic_metrics", "BUILTIN_TASKS", "make_task", "resolve_task_class",
    "HistogramTask", "MeanTask", "SumTask",
]
