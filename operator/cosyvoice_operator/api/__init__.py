"""The vocabulary: the service spec as typed values, labels and annotations, GPU facts, engine
identity, conditions, and the effects a plan returns. Pure, and imports nothing else of the
package."""
