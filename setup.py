# Build script for smallem_spec, driven by settings.ini (nbdev 2 layout).
# Unlike nbdev's template it does not import pkg_resources (gone from current setuptools).
from configparser import ConfigParser
import setuptools
from packaging.version import parse

assert parse(setuptools.__version__) >= parse('36.2')

config = ConfigParser(delimiters=['='])
config.read('settings.ini', encoding='utf-8')
cfg = config['DEFAULT']

licenses = {'apache2': ('Apache Software License 2.0', 'OSI Approved :: Apache Software License')}
statuses = ['1 - Planning', '2 - Pre-Alpha', '3 - Alpha', '4 - Beta', '5 - Production/Stable',
            '6 - Mature', '7 - Inactive']
py_versions = '3.10 3.11 3.12 3.13'.split()

lic = licenses[cfg['license']]
min_python = cfg['min_python']
requirements = cfg.get('requirements', '').split()
dev_requirements = cfg.get('dev_requirements', '').split()
scripts = [s.strip() for s in cfg.get('console_scripts', '').split('\n') if s.strip()]

setuptools.setup(
    name=cfg['lib_name'],
    version=cfg['version'],
    description=cfg['description'],
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    author=cfg['author'],
    author_email=cfg['author_email'],
    url=cfg['git_url'],
    license=lic[0],
    keywords=cfg['keywords'],
    classifiers=['Development Status :: ' + statuses[int(cfg['status'])],
                 'Intended Audience :: ' + cfg['audience'].title(),
                 'License :: ' + lic[1],
                 'Natural Language :: ' + cfg['language'].title()] +
                ['Programming Language :: Python :: ' + o for o in py_versions[py_versions.index(min_python):]],
    packages=setuptools.find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*']),
    include_package_data=True,
    install_requires=requirements,
    extras_require={'dev': dev_requirements},
    python_requires='>=' + min_python,
    entry_points={'console_scripts': scripts, 'nbdev': [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"]},
    zip_safe=False,
)
