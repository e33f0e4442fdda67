# Installs the prebuilt JupyterLab extension and the server extension's enabling config into the
# wheel's data folder, which pip places under sys.prefix:
#   share/jupyter/labextensions/mlx-jupyter-lab/   (what `jupyter labextension list` finds)
#   etc/jupyter/jupyter_server_config.d/mlx_jupyter.json   (enables mlx_jupyter.server)
# Included from the top-level CMakeLists.txt: include(labextension/install.cmake)
# The built extension is committed (mlx_jupyter/server/labextension); rebuild it with
#   cd labextension && npm ci && npm run build:prod
if(DEFINED SKBUILD_DATA_DIR)
  set(_mlxj_labext "${CMAKE_CURRENT_LIST_DIR}/../mlx_jupyter/server/labextension")
  if(NOT EXISTS "${_mlxj_labext}/package.json")
    message(FATAL_ERROR "the lab extension is not built: cd labextension && npm ci && npm run build:prod")
  endif()
  install(DIRECTORY "${_mlxj_labext}/"
          DESTINATION "${SKBUILD_DATA_DIR}/share/jupyter/labextensions/mlx-jupyter-lab")
  install(FILES "${CMAKE_CURRENT_LIST_DIR}/install.json"
          DESTINATION "${SKBUILD_DATA_DIR}/share/jupyter/labextensions/mlx-jupyter-lab")
  install(FILES "${CMAKE_CURRENT_LIST_DIR}/jupyter-config/server-config/mlx_jupyter.json"
          DESTINATION "${SKBUILD_DATA_DIR}/etc/jupyter/jupyter_server_config.d")
endif()
