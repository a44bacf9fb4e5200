"""The topic router: a word trie with `*` and `#` children, plus a bounded route cache.

Part of `hutch.core.routing` (see its docstring for the rules).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .bindings import (
    NO_DESTINATIONS,
    TOPIC_ROUTE_CACHE_ENTRIES,
    Binding,
    Destination,
    Destinations,
    _BindingTable,
    _decr,
    _incr,
)


def split_topic_key(key: str) -> list[str]:
    """Words of a routing or binding key, as RabbitMQ splits them: "" has no words, "a..b" three."""
    return key.split(".") if key else []


class _TrieNode:
    """One word position in the topic trie.

    Invariants: a non-root node has bindings or children; `hash_child is children.get("#")`.
    """

    __slots__ = ("children", "hash_child", "counts", "parent", "word", "is_hash", "cached")

    def __init__(self, parent: _TrieNode | None, word: str) -> None:
        self.children: dict[str, _TrieNode] = {}
        self.hash_child: _TrieNode | None = None
        self.counts: dict[Destination, int] = {}
        self.parent = parent
        self.word = word
        self.is_hash = word == "#"
        self.cached: Destinations | None = None

    def destinations(self) -> Destinations:
        cached = self.cached
        if cached is None:
            cached = self.cached = Destinations.of(self.counts)
        return cached


def _with_hash_chains(nodes: Iterable[_TrieNode]) -> dict[_TrieNode, None]:
    """The nodes plus the chain of "#" children below each ("#" may match zero words), deduplicated."""
    closed: dict[_TrieNode, None] = {}
    for node in nodes:
        closed[node] = None
        chained = node.hash_child
        while chained is not None and chained not in closed:
            closed[chained] = None
            chained = chained.hash_child
    return closed


class TopicRouter(_BindingTable):
    """Topic matching with a word trie whose edges are literal words, "*" and "#".

    Matching simulates the trie as an NFA: the active node set advances one routing-key word at a time
    (literal child, "*" child, and a "#" node may stay where it is), so cost is O(words x active nodes)
    whatever the number of bindings, and "#.#.#" patterns cannot blow up exponentially. Results are
    memoised per routing key in a bounded FIFO cache that any add or remove clears.
    """

    __slots__ = ("_root", "_cache", "_cache_entries")

    def __init__(self, cache_entries: int = TOPIC_ROUTE_CACHE_ENTRIES) -> None:
        super().__init__()
        self._root = _TrieNode(None, "")
        self._cache: dict[str, Destinations] = {}
        self._cache_entries = cache_entries

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None,
              message: Any = None) -> Destinations:
        cache = self._cache
        cached = cache.get(routing_key)
        if cached is not None:
            return cached
        result = self._match(split_topic_key(routing_key))
        if self._cache_entries:
            if len(cache) >= self._cache_entries:
                del cache[next(iter(cache))]
            cache[routing_key] = result
        return result

    def _match(self, words: list[str]) -> Destinations:
        root = self._root
        active: Iterable[_TrieNode] = _with_hash_chains((root,)) if root.hash_child else (root,)
        for word in words:
            following: list[_TrieNode] = []
            # A literal "*" or "#" word in the key would find the same child as the wildcard rules.
            literal = word != "*" and word != "#"
            for node in active:
                if node.is_hash:
                    following.append(node)
                children = node.children
                if children:
                    if literal:
                        child = children.get(word)
                        if child is not None:
                            following.append(child)
                    child = children.get("*")
                    if child is not None:
                        following.append(child)
            if not following:
                return NO_DESTINATIONS
            active = _with_hash_chains(following)
        matched = [node.destinations() for node in active if node.counts]
        if len(matched) == 1:
            return matched[0]
        return Destinations.of(frozenset().union(*matched)) if matched else NO_DESTINATIONS

    def _index(self, binding: Binding) -> None:
        node = self._root
        for word in split_topic_key(binding.routing_key):
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _TrieNode(node, word)
                if child.is_hash:
                    node.hash_child = child
            node = child
        _incr(node.counts, binding.destination)
        node.cached = None
        self._cache.clear()

    def _unindex(self, binding: Binding) -> None:
        node = self._root
        for word in split_topic_key(binding.routing_key):
            node = node.children[word]
        _decr(node.counts, binding.destination)
        node.cached = None
        self._cache.clear()
        parent = node.parent
        while parent is not None and not node.counts and not node.children:
            del parent.children[node.word]
            if node.is_hash:
                parent.hash_child = None
            assert parent.hash_child is parent.children.get("#")
            node, parent = parent, parent.parent

    def node_count(self) -> int:
        """Trie nodes below the root (for tests: removal must prune)."""
        stack, count = [self._root], 0
        while stack:
            children = stack.pop().children.values()
            count += len(children)
            stack.extend(children)
        return count


# ---------------------------------------------------------------------------------------------------
# headers

