// macOS's <uuid/uuid.h>, as far as platform_darwin.cpp uses it (see ../darwin_only.h).
#pragma once
typedef unsigned char uuid_t[16];
