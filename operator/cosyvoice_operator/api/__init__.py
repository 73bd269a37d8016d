"""The vocabulary: the service spec as typed values (spec; its field readers and the shapes of
the Kubernetes types it embeds in fields; its schedule floors in schedule_fields), labels and
annotations, GPU facts, engine identity, conditions, and the effects a plan returns. Pure, and
imports nothing else of the package."""
