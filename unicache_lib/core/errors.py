"""Every error the workbench raises, under one root: ``except UnicacheError`` catches them all.

One class per kind; each keeps the built-in base callers already catch (``ValueError``, ``RuntimeError``,
``KeyError``, ``OSError``) as a mixin, so ``except ValueError`` around a bad argument still works::

    UnicacheError
    ├── InputError (ValueError)            an argument, file or parameter the workbench cannot use as given
    │   ├── ImageError, PromptError, LayerError, SpanError, ParameterError, ReportError (FileExistsError)
    │   ├── MissingFileError (FileNotFoundError)   ModelNotFoundError
    │   ├── AttentionValueError, AttentionMaskError     maps that are not probabilities / leak past their mask
    │   ├── InputTypeError (TypeError)     an argument of the wrong type
    │   └── UnknownNameError (KeyError)    a name nothing is registered under
    ├── UnsupportedError                   this model or family cannot do what was asked (the message says what can)
    │   ├── UnsupportedModelError (ValueError), PrefillPruningUnsupported (ValueError)
    │   └── PeerUnsupported (RuntimeError)
    ├── ContractError (RuntimeError)       a model, policy, plug-in or call order broke what the code relies on
    │   └── CaptureError                   a capture that cannot give correct attention
    ├── StoreError (RuntimeError)          a store missing, corrupt or about to be overwritten
    ├── LockedError (RuntimeError)         another process holds the lock (StoreLockedError: both)
    └── ChecksumError (OSError)            a weight file that is not the one its model card records

Every message says what to do instead; ``tests/test_errors.py`` checks that every ``raise`` in the package raises
one of these.
"""

class UnicacheError(Exception):
    """The root of every error the workbench raises."""


class InputError(UnicacheError, ValueError):
    """An input the workbench cannot use as given; the message says what to pass instead."""


class InputTypeError(InputError, TypeError):
    """An argument of a type the function does not take."""


class ImageError(InputError):
    """An image of a shape, type or value range that cannot be converted exactly to RGB uint8."""


class PromptError(InputError):
    """A prompt or question without (or with too many of) the family's image marker."""


class SpanError(InputError):
    """Modality spans that do not fit the sequence they are applied to."""


class ParameterError(InputError):
    """A notebook parameter with a value the notebook cannot use; the message names it and the fix."""


class ReportError(InputError, FileExistsError):
    """A store (or output directory) the report cannot use; the message is one line saying why. A
    ``FileExistsError`` too, as an output folder the report did not write is refused with one."""


class AttentionValueError(InputError):
    """Attention weights that are not probabilities (NaN / inf / negative)."""


class AttentionMaskError(InputError):
    """A map with attention mass on keys its (assumed or applied) mask hides."""


class UnknownNameError(InputError, KeyError):
    """A name no piece is registered under; the message lists the registered names.

    A ``KeyError`` (so ``except KeyError`` and ``dict.get`` idioms keep working) whose ``str()`` is the
    message itself, not its quoted repr."""

    def __init__(self, message: str, name=None, known=()):
        super().__init__(message)
        self.name, self.known = name, tuple(known)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class DuplicateNameError(InputError):
    """A second piece registered under a name a registry already holds (a plug-in's name clash: rename one)."""


class UnsupportedError(UnicacheError):
    """This model or family cannot do what was asked; the message says why and what can."""


class UnsupportedModelError(UnsupportedError, ValueError):
    """The model is not of a family the workbench knows how to capture."""


class PrefillPruningUnsupported(UnsupportedError, ValueError):
    """This family cannot be pruned before its language model (the message says why and what to use)."""


class PeerUnsupported(UnsupportedError, RuntimeError):
    """This diffusers cache cannot run on this model (the message says why)."""


class ContractError(UnicacheError, RuntimeError):
    """A model, policy, plug-in or call order did not behave as the code relies on (a shape, a call, a count)."""


class CaptureError(ContractError):
    """A capture that cannot give correct attention (with what to do instead)."""


class LayerError(InputError):
    """Layer indices that do not exist in the model (or are not integers)."""


class StoreError(UnicacheError, RuntimeError):
    """A store that is missing, corrupt, or would be overwritten."""


class LockedError(UnicacheError, RuntimeError):
    """Another process holds the lock. ``holder`` is what it wrote into the lock file (may be ``{}``)."""

    def __init__(self, message: str, holder: dict):
        super().__init__(message)
        self.holder = holder


class StoreLockedError(StoreError, LockedError):
    """Another process is writing this store (the same rank). ``holder``: its pid, host, since, cmd (``__init__`` is
    :class:`LockedError`'s, next in the method order)."""


class MissingFileError(InputError, FileNotFoundError):
    """A file or folder that is not there; the message names it and how to make it."""


class ModelNotFoundError(MissingFileError):
    """A model name that is not a shipped model, an existing folder or a usable hub id; raised at once,
    before any download is attempted."""


class ChecksumError(UnicacheError, OSError):
    """A weight file of a model folder is not the one its ``model_card.json`` records (changed, missing or
    unrecorded). The message names the file, both digests and how to restore or accept it."""
