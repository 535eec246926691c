"""gradtool graph: walk an autograd graph into plain data and render it (tree, dot, mermaid, json)."""
