"""What pagetrace shows: the terminal renderings (Rich) of each command's results, the
block-mapping diagrams (`diagram/`: DOT, SVG, PNG and the terminal map) and the simulator's
pictures. Views read the other packages' results; nothing below imports a view.
"""
