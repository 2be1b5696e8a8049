"""End-to-end training on megatron-core with a selectable MoE dispatcher (`moe-backend train`)."""
