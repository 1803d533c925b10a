"""The prescreener's three splits (train, dev, validation) from its config, checked.

    splits = config_splits(config.data)
    examples = load_split_examples(splits, ("train", "dev", "validation"))

Training articles come from `--config.data.file`, dev and validation ones from
`--config.data.eval_file` ("" = the same file), as the reader configs take `squad_file` and
`validation_file`: the default trains on the complete SQuAD v1.1 training set and early-stops /
validates on the shared dev articles. Every
error names the config key the user would change; a training article that is also a dev or
validation article is refused (the dev accuracy picks the params and the validation accuracy is
the reported one: neither may be measured on questions the model trained on).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from dil_jax.data.squad import SquadExample, load_squad, select_articles
from dil_jax.errors import DilJaxError, InputFileError, UsageError

SPLITS = ("train", "dev", "validation")
# The config key of each split's article slice.
ARTICLE_KEYS = dict(train="train_articles", dev="dev_articles", validation="val_articles")


@dataclasses.dataclass(frozen=True)
class Split:
    """One split: its SQuAD file and article slice, and the flags that set them."""

    name: str
    file: str
    file_flag: str
    articles: str
    articles_flag: str

    def describe(self) -> str:
        """e.g. "train-v1.1.json 0:442" for a results table."""
        return f"{Path(self.file).name} {self.articles}"


def _flag(key: str) -> str:
    return f"--config.data.{key}"


def config_splits(data: Mapping) -> dict[str, Split]:
    """The Split of each name in SPLITS from a config's `data` section (a ConfigDict or a
    dict); a missing, empty or non-string value is a UsageError naming its key, but an empty
    `val_articles` means no validation split: runs that choose a config by the dev accuracy
    need not see the validation one, which is reported once, for the chosen config."""
    for key in ("file", "train_articles", "dev_articles"):
        value = data.get(key)
        if not isinstance(value, str) or not value.strip():
            raise UsageError(f"{_flag(key)} = {value!r}: expected a non-empty string (a SQuAD "
                             "file for data.file, an article slice START:STOP for the others)")
    if not isinstance(data.get("val_articles"), str):
        raise UsageError(f"{_flag('val_articles')} = {data.get('val_articles')!r}: expected an "
                         "article slice START:STOP, or '' for no validation split")
    eval_file = data.get("eval_file", "")
    if not isinstance(eval_file, str):
        raise UsageError(f"{_flag('eval_file')} = {eval_file!r}: expected a SQuAD file, or '' "
                         "for the same file as --config.data.file")
    eval_key = "eval_file" if eval_file else "file"
    files = dict(train=("file", data["file"]), dev=(eval_key, eval_file or data["file"]),
                 validation=(eval_key, eval_file or data["file"]))
    return {name: Split(name, files[name][1], _flag(files[name][0]), data[ARTICLE_KEYS[name]],
                        _flag(ARTICLE_KEYS[name]))
            for name in SPLITS if data[ARTICLE_KEYS[name]].strip()}


def _load_file(path: str, flag: str) -> list[SquadExample]:
    try:
        return load_squad(path).examples
    except OSError as error:
        raise InputFileError(f"{flag} = {path!r}: cannot read it ({error})") from None
    except DilJaxError as error:  # missing file, not SQuAD JSON, a bad answer span
        raise InputFileError(f"{flag} = {path!r}: {error}") from None


def load_split_examples(splits: Mapping[str, Split], names: Sequence[str] | None = None
                        ) -> dict[str, list[SquadExample]]:
    """The examples of each named split (default: all of `splits`; each file read once),
    checked: no article is in two of them."""
    names = list(splits) if names is None else names
    loaded: dict[str, list[SquadExample]] = {}
    chosen = {}
    for name in names:
        split = splits[name]
        if split.file not in loaded:
            loaded[split.file] = _load_file(split.file, split.file_flag)
        chosen[name] = select_articles(loaded[split.file], split.articles, split.articles_flag)
    check_disjoint(splits, chosen)
    return chosen


def check_disjoint(splits: Mapping[str, Split],
                   examples: Mapping[str, Sequence[SquadExample]]) -> None:
    """Refuses two splits that share an article (by title; SQuAD's train and dev files have
    none in common), naming both slices: a UsageError."""
    titles = {name: {example.title for example in chosen} for name, chosen in examples.items()}
    names = list(examples)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            shared = titles[first] & titles[second]
            if shared:
                a, b = splits[first], splits[second]
                raise UsageError(
                    f"{a.articles_flag}={a.articles} ({a.file}) and {b.articles_flag}="
                    f"{b.articles} ({b.file}) share {len(shared)} article(s), e.g. "
                    f"{sorted(shared)[0]!r}: the {first} and {second} splits must not overlap; "
                    "give disjoint slices")
