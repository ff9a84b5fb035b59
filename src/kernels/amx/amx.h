/*
 * amx.h - what the AMX kernels share: the 64-byte tile configuration LDTILECFG reads (palette 1:
 * bytes per row and rows of each of the 8 tiles; unused tiles stay zero).  Declare configs as
 * static objects: GCC 12 drops stores to a local one before _tile_loadconfig.
 */
#ifndef FL_AMX_H
#define FL_AMX_H

#include <stdint.h>

typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

#endif
