#!/usr/bin/env bash
# Installs the Debian packages of CJK fonts that `python -m bench.glyphs` draws its
# characters with (14 fonts of distinct designs, about 130 MB downloaded; the list is
# bench/glyph_fonts.py FONT_PACKAGES). Idempotent: returns at once when all are there.
set -euo pipefail
PACKAGES="fonts-noto-cjk fonts-arphic-ukai fonts-arphic-uming fonts-cwtex-kai fonts-cwtex-ming fonts-droid-fallback"
PACKAGES+=" fonts-hanazono fonts-ipaexfont-gothic fonts-ipaexfont-mincho fonts-seto fonts-wqy-zenhei"

missing=()
for package in $PACKAGES; do
    if [ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)" != "install ok installed" ]; then
        missing+=("$package")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install_glyph_fonts.sh: all $(echo $PACKAGES | wc -w) font packages are installed"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
      echo "install_glyph_fonts.sh: run as root (apt-get install ${missing[*]})" >&2
      exit 1
    fi
    SUDO=sudo
fi
echo "install_glyph_fonts.sh: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
