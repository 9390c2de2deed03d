.PHONY: assets

# Redraw every picture in assets/ (SVG, deterministic: a rerun changes no bytes).
assets:
	bash scripts/make_assets.sh
