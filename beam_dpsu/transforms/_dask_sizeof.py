"""Dask's size of Beam's elements: the ``dask.sizeof`` entry point (``setup.py``).

Part of the runner adaptations of ``transforms/runners.py``, in a module of its own
because Dask loads its entry points while ``import dask`` runs, in every process of
an environment where this package is installed: this module imports only the
standard library, so that loading it costs nothing and cannot fail; Beam's class is
looked up only when Dask first sizes one of Beam's objects.

Beam's Dask runner hands Dask elements wrapped in Beam's ``WindowedValue`` (a
``GroupByKey``'s input pairs ``(key, WindowedValue(value))``, and tagged outputs),
and Dask's default ``sizeof`` of an object it does not know is ``sys.getsizeof``:
about 100 bytes, whatever the element holds. A partition of 8 MiB Arrow messages
then counted as a few kilobytes of managed memory, so a worker neither spilled it nor
paused in time. Here a ``WindowedValue`` counts as its wrapper plus the ``sizeof``
of its value. (Spilling still cannot free what the runner's ``ParDo`` receivers
keep: ``docs/runners.md``, "Dask".)
"""
import sys

__all__ = ["register_beam_sizes"]


def register_beam_sizes(sizeof) -> None:
    """Registers, lazily, Dask's ``sizeof`` of Beam's ``WindowedValue`` on Dask's
    dispatcher ``sizeof`` (what Dask passes to a ``dask.sizeof`` entry point)."""

    @sizeof.register_lazy("apache_beam")
    def _register_beam():
        from apache_beam.utils.windowed_value import WindowedValue

        @sizeof.register(WindowedValue)
        def _sizeof_windowed_value(wv):
            return sys.getsizeof(wv) + sizeof(wv.value)
